from kvbench_node_agent.agent import main

main()
