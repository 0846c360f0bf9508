"""kvbench_planner"""
