"""kvbench_node_agent"""
