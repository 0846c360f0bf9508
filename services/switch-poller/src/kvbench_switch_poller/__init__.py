"""kvbench_switch_poller"""
