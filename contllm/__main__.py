"""``python -m contllm`` runs the command line; ``accelerate launch -m contllm run ...`` needs it."""

from contllm.cli.commands import main

if __name__ == "__main__":
    main()
