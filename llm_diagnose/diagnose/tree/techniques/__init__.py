"""The remedies, one record per technique (`record.Technique`), one file per technique.

The registry is the explicit tuple in `catalogue`; the diagnosis's identifiers, the headline's
ranking, the nodes that record a technique on, and verify's claims and adoption facts are all
read from the records there.
"""
