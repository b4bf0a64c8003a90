"""The routing policy file at run time: the live generation and swapping it (file watch, SIGHUP,
admin API), and the checks beyond its schema."""
