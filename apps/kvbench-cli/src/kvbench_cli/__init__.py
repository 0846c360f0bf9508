"""kvbench_cli"""
