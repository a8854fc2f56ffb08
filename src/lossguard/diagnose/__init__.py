"""Diagnosis: findings + run facts -> verdict, signature, onset, ranked root causes."""
