from kvbench_planner.main import main

main()
