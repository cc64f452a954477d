"""ragctl: the thin command-line client of ragd (imports only ragd.protocol)."""
