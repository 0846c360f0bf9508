from kvbench_sim.cli import main

main()
