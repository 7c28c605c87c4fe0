"""The studies behind results/bench: convergence (Fig. 3c), translation quality and its plateau
(Table 1), depth (Fig. 4b), large batch (Fig. 4c), speed and memory; each plans its runs from the method
table (tfixup/methods.py), runs what its store lacks (``runs``) and writes its report, figure and JSON."""
