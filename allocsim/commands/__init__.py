"""One module per subcommand (memray's layout); see `allocsim.cli`."""
