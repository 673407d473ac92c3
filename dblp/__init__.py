"""DBLP: Dynamic Bounded-Loss Protocol for gradient transport."""
