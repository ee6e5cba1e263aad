from autotune.cli.app import main

main()
