"""DSpark and DFlash: the block draft (`model`), the `dspark` and `dflash` speculators
formats (`export`), and left-to-right block drafting for evaluation (`drafter`)."""
