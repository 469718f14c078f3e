"""What the loop and the servers share of training itself: optimizers on the flat buffer
(`optim`), the input pipeline (`loader`), held-out evaluation (`evaluation`)."""
