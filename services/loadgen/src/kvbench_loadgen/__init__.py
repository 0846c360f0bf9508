"""kvbench_loadgen"""
