from tinygpt_cli.entry import main

main()
