"""The one exception the data-source readers raise for bad or missing data."""


class DataError(ValueError):
    """A data file is missing, corrupt, truncated or not the official release.

    The message names the file and says what to do about it (where to put the file, how to
    download it again). A ``ValueError`` so callers that validate inputs catch it as such.
    """
