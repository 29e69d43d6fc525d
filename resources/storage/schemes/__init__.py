"""The storage schemes, one module each, named as the URL's scheme names them.

Each module has ``open_url(url, *, home)``: the storage a ``PIPELINE_STORAGE_URL`` of that
scheme names. :mod:`resources.storage.storage_schemes` finds them by name.
"""
