"""Launchers: start servers and trainers with the environment contract."""
