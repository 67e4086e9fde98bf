"""The coding environment's server side: the sandbox, the grader and the tasks."""
