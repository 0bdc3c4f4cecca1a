from podguard.cli.app import main

main()
