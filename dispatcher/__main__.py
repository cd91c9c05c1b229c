from dispatcher.cli import main

main()
