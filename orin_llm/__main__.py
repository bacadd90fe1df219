from orin_llm.cli import main
main()
