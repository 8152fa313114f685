from kvpreflight.cli import main

main()
