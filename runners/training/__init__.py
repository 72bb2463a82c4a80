"""Training: a run's resolved configuration (`config`), the loop (`loop`) and its optimizer
(`optimizer`), executing a pack of runs (`execute`), and the record store (`store`)."""
