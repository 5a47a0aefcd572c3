from tinygpt_cli.cli import main

main()
