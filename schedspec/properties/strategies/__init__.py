"""What Hypothesis draws, and how: configs and the regimes that narrow them into bugs'
corners, the state machine's actions, integers taken straight from the choice sequence,
and Hypothesis' pool of local constants pinned empty so a seed draws the same examples
wherever it runs.
"""
