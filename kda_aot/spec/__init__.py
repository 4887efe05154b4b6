"""What a prefill call is: its tensor arguments, its gate and beta forms, and the validated problem
that the wall hands the planner."""
