"""How numbers are taken: the measurement protocol, machine description, accelerator handling, fidelity."""
