"""kvbench_stacks: what a stack is (the catalog and its topology facts), the models and GPUs kvbench knows, and
how each stack is launched (the recipes). Imported by the planner (review, placement), the node agent (launch)
and the simulator (which stacks have a simulated form); it runs nothing itself."""
