"""Host-side computation of model inputs and guards the stack does not lower (being written; registers nothing yet)."""
