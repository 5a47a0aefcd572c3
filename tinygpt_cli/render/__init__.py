"""Presentation: Rich tables and heatmaps for people, JSON documents for programs."""
