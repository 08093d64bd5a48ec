"""The command lines. A package only so that the tests can import a tool's functions
(``from tools import infer``); each tool runs as a script and imports ``vitdense`` alone."""
