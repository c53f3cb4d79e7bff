"""The commands behind `attnx <command>`: typed functions whose signatures are their options and whose
docstrings are their help, and the LightningCLI commands `fit`, `validate`, `test` and `predict`
([attnx.commands.lightning][]). They import heavy libraries (torch, Lightning) only when they run, so
`--help` is quick. Nothing in the library imports from here.
"""
