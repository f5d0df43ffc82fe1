"""What several test modules share: cases, stand-ins and comparisons (no tests here)."""
