from benchmarks.harness.cli import main

main()
