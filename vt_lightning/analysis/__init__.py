"""Pure functions over plain data: when to record, and what a recorded window means. No torch,
Lightning or VizTracer: the writer process and the CLI import it, and it is tested without a
Trainer."""
