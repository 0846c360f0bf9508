"""kvbench_sim"""
