"""League training (AlphaStar) and population-based training over the one rollout engine.

match_table.py  who played whom: AlphaStar's decayed win/draw/loss table and mean returns
ratings.py      Elo and openskill's Plackett-Luce skill rating, game by game
pfsp.py         prioritized fictitious self-play: the weightings of a win rate
settings.py     every league constant as a typed setting, AlphaStar's value by default
players.py      the league's members (learning players, snapshots) and their matchmaking
"""
