"""Tests of jobrun.observe: metrics, traces and health, behind their extras."""
