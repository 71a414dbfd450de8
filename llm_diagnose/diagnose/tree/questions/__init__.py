"""The questions of the tree, one module each: its reading of the evidence (`ask_*`, a pure
function returning an `Answer`), and its branch (`walk_*`, deciding the status of the techniques
it governs). `catalogue.QUESTIONS` lists them in the order the walk asks and walks them.
"""
