"""kvbench_workloads: the traffic a plan describes, as sessions of turns.

Imported by the load generator (which sends the turns to engines) and by the simulator's batch mode (which
replays them in virtual time); neither imports the other. Nothing here does I/O beyond reading data sets.
"""
