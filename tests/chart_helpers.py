"""Reading what a page hands to its uPlot charts."""

import json
import re


def chart_data(body: str) -> dict:
    """The charts' JSON payload (``json_script`` "chart-data") in the page ``body``."""
    return json.loads(re.search(r'<script id="chart-data" type="application/json">(.*?)</script>', body, re.S).group(1))
