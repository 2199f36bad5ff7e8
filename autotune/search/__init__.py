"""Search: Optuna over the swap parameters with the budgets as constraints (`core`), the
studies that keep its trials (`studies`), the largest batch (`batching`), `fit` and its result
(`tuning`), and host memory as a limit (`host`)."""
