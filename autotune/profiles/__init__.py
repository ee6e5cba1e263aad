"""What a person takes away: exported launch profiles, their verification, the report."""
