from kvpreflight._internal.cli import main

main()
