from tinygpt_cli.cli.entry import main

if __name__ == "__main__":  # not when multiprocessing imports it in a worker (spawn)
    main()
