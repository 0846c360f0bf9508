from kvbench_loadgen.service import main

main()
