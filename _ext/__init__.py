"""Compiled core of lscore (installed as lscore._ext); see lsc_state.h and lsc_scan.h."""
