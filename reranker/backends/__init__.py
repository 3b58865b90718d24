"""Model backends of the RerankerService, behind one small abstract base."""
