"""kvbench_reporter"""
