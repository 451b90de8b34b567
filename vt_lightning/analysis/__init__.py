"""Pure functions over plain data: what to record and when (schedule, window plan, trigger rules,
lifecycle table), and what a recorded window means (clock maths, merge, filters, the user-code
classifier, the summary and its verdicts, diff). No torch, Lightning or VizTracer: the writer
process and the CLI import it, and all of it is unit-tested without a Trainer."""
