"""Utilities the package shares: atomic and all-or-none writes (:mod:`.atomic`), input files read
with one-line errors (:mod:`.inputs`), the validation layer and its one error formatter
(:mod:`.validation`), progress on stderr (:mod:`.progress`), table files
(:mod:`.tables`), the console (:mod:`.console`) and PEP 562 lazy package attributes (:mod:`._lazy`).
"""
