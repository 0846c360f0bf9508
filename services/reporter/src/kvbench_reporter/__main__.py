from kvbench_reporter.service import main

main()
