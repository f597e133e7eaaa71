"""Everything that reaches into a dependency's private API, one module per dependency.

Each module names the versions it was written and tested against (`WRITTEN_FOR`);
`tests/test_compat.py` fails loudly when the installed version is another, so an upgrade is a
deliberate act: re-read the private code these modules lean on, then extend `WRITTEN_FOR`.
"""
