"""`periscope report`: a simulated run's accuracy against its ground truth (`score`), read and printed
(`text`)."""
