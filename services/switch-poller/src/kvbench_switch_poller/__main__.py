from kvbench_switch_poller.service import main

main()
